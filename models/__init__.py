"""Fitted predictors shipped with opcast (models/default is the embedded default)."""
