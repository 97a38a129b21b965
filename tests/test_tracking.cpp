// Trackers: CSV, JSON lines and TensorBoard event files (filled in by the tracking work).
