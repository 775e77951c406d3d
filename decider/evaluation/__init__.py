"""Measuring and fitting decisions on labelled examples: the fits behind `decider calibrate`,
the metrics and plots of `decider eval`, and the simple baseline they are compared with."""
