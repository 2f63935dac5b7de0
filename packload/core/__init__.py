"""The ground both sides stand on: the on-disk format, errors, safe file reading, image probing and
folder scanning, CPU and storage facts, worker processes, and the compiled resize kernel. Nothing
here imports the writers, the readers or anything above them."""
