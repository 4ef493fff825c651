"""What a run leaves behind: its output folder and the names of the files in it (shared
with report/), and the environment recorded to reproduce it."""
