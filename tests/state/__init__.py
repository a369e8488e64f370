"""The pure core (txstream/state): the transition table, buckets, state keys, the state's
layouts."""
