"""The SDC audit of the EM pass: the audit driver, the SPMD agreement, fault injection, receipts, fold binding."""
