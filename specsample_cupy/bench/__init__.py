"""`specsample bench verify` and `specsample bench decode`: timings against the baseline of the same run."""
