"""The SDC audit of the EM pass: the audit's state, its judge, draw, placed rounds and peer replays, the SPMD agreement,
fault injection, findings, receipts, fold binding."""
