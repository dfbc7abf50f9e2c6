"""mixle's EM submodule names: each facade module re-exports the real objects, also importable from the package."""

from __future__ import annotations

import importlib

import pytest

import mixle_parallel

FACADES = {
    "em_observability": ["RankRecord", "record_rank_round", "records_from_events", "detect_stragglers",
                         "imbalance_receipt", "plan_rebalance_weights", "fit_report", "FitReport",
                         "StragglerReport", "ImbalanceReceipt"],
    "sdc_audit": ["AuditedMPEncodedData", "SDCAuditReceipt", "inject_bit_flip", "finite_guarded_fold"],
    "balance": ["BalancePlan", "balance_plan", "auto_balanced_estimator"],
    "model_decomposition": ["compute_cost", "cost_children", "subtree_work", "size_model_tree", "tree_axes",
                            "best_parallel_axis", "decompose_model", "ModelCut", "ModelDecomposition"],
    "resilient_em": ["ResilientMPEncodedData", "checkpointed_fold"],
    "torchrun": ["TorchRunEncodedData", "torchrun_out"],
    "ray_data": ["RayEncodedData"],
    "lightning_data": ["LightningEncodedData", "minibatches", "stochastic_em"],
}


@pytest.mark.parametrize("module", sorted(FACADES))
def test_facade_reexports_the_real_objects(module):
    facade = importlib.import_module(f"mixle_parallel.{module}")
    for name in FACADES[module]:
        assert name in facade.__all__, (module, name)
        obj = getattr(facade, name)
        assert getattr(mixle_parallel, name) is obj, (module, name)  # one implementation, two import paths
        assert obj.__module__.startswith("mixle_parallel.executors."), (module, name, obj.__module__)
