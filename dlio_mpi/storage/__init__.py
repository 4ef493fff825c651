"""The file systems under the folders: their type and mount (mountinfo, statfs), Lustre
striping (lfs setstripe, getstripe), and node-local folders (node_local.py)."""
