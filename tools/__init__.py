"""Build tools of the book: the chapter reader, the exporter and the notebook writer."""
