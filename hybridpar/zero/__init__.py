"""ZeRO on the DP (x CP) axis: the DeepSpeed engine per stage, gradient reduction in buckets, the weight gather, the gradient norm."""
