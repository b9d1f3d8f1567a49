"""pylease's benchmarks: ``make bench`` measures pylease against a floor and its peers.

Every number is a ratio against a floor (or a peer) measured in the same run,
contenders interleaved round by round, so that a shared or noisy machine moves
both sides alike. ``python -m benchmarks --help`` lists the options.
"""
