"""Copies of the dataset on a faster tier: stage-in before training, the cache tier filled
while training, read-once staging into the ranks' memory."""
