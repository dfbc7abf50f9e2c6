"""EM fit strategies beside the full-batch loop: starts (k-means++ and others), stochastic mini-batch EM."""
