"""``mixle.utils.parallel.sdc_audit`` names over our EM audit (re-exported): the audited mp handle,
mismatch receipts, the bit-flip primitive and the NaN/Inf-guarded fold."""

from mixle_parallel.executors.estimation.compat.audited_mp import AuditedMPEncodedData, SDCAuditReceipt, inject_bit_flip
from mixle_parallel.executors.estimation.em_pass.finite_guard import NonFiniteStatisticError, finite_guarded_fold

__all__ = ["AuditedMPEncodedData", "NonFiniteStatisticError", "SDCAuditReceipt", "finite_guarded_fold",
           "inject_bit_flip"]
