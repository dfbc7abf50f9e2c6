"""What each EM worker did in each pass (metering) and the verdicts read from it."""
