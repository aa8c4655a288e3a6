"""opcast.collect: measure ops and collectives on real devices, or replay published measurements, into datasets."""
