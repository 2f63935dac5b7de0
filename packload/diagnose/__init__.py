"""Is slow training the GPU's fault? ``tune`` measures loader settings against a training step,
``doctor`` checks the machine and a dataset, ``stall`` and ``measure`` time where a pipeline waits.
They use the readers and writers; nothing below imports them."""
