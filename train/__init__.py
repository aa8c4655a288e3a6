"""opcast.train: learned kernel predictors fitted on opcast datasets (see the train issue)."""
