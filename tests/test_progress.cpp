// The progress bar (filled in by the progress work).
