"""The plan of a run, derived from the configuration before any I/O: what will be read and
written, the checks that need the whole plan, the notes and the rendering."""
