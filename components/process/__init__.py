"""The step process: the runner every task calls, the torchrun and TrainJob launchers, warm-ahead, start-up."""
