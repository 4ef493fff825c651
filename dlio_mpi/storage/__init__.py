"""The file systems under the folders: their type and mount (mountinfo, statfs), and Lustre
striping (lfs setstripe, getstripe)."""
