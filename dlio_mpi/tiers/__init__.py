"""Copies of the dataset on a faster tier: stage-in before training, the cache tier filled
while training (reader.staging's copies in memory are reader backends: readers/)."""
