"""opcast.predict: decompose archs into ops, cost them and compose distributed training/inference time."""
