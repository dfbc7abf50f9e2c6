"""One canonical-bytes walker (contracts.canonical_bytes.walk) under two frozen layouts: the digests are recorded
(ledgers, receipts, audit records), so these values, computed on main before the walkers became one, must not move."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts.canonical_bytes import STATISTIC_LAYOUT, walk
from mixle_parallel.contracts.estimation import StatisticFormatError, canonical_statistic_bytes, statistic_digest
from mixle_parallel.verification.sdc.digest import CHECKSUM_LAYOUT, digest

STATISTICS = {
    "mixture": {"weights": np.array([0.25, 0.75]), "means": (np.arange(6, dtype=np.float32).reshape(2, 3), -0.0),
                3: [None, True, np.int64(-(2**62)), -(2**70), 2**64], "name": "k\u00e9", "raw": b"\x00\xff",
                "ba": bytearray(b"ab")},
    "scalars": (np.float32(1.5), np.float64(float("nan")), 1 + 2j, np.complex64(3 - 1j), np.bool_(False), 0, -1, 255),
    "big_endian": np.array([[1, 2], [3, 4]], dtype=">i4"),
    "empty": ((), {}, np.zeros((0, 3)), ""),
}
STATISTIC_DIGESTS = {
    "mixture": "sha256:4405a27d3de0f86893e6d5cefb5274e120a8d7c45ebc726e6777eed78152170f",
    "scalars": "sha256:5a6cde3f606a050a0bc9f98f0411d37763ad978f6c9c0b953c29d36b84a67d03",
    "big_endian": "sha256:8e05e0b77ff1d6bcf76b0b00ab18e599da1c748e6fee0523cc1d05da0f69c81b",
    "empty": "sha256:ef0e3cbd7bdbb1a8903098325a96cee40b213ef83ac43cd15b0f1679dc24f3c4",
}


def _checksum_cases() -> dict:
    torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
    return {
        "tree": {"b": [1, 2.5, None, True, "x\u00e9", b"\x01"], 2: (np.float64(0.5), np.bool_(True), np.int32(-7)),
                 "a": {}},
        "arrays": [np.arange(12, dtype=">f8").reshape(3, 4), np.array([True, False]), np.zeros((2, 0), dtype=np.int16)],
        "tensors": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                    "h": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                    "i": torch.tensor([[1, 2]], dtype=torch.int64), "e": torch.zeros(0)},
        "scalars": (0, -(2**80), float("-inf"), -0.0, "", b""),
    }


CHECKSUM_DIGESTS = {
    "tree": "sha256:b480f2f7011dd86fecc32ec030d9e0f77b50224a133b6c192445fe9b70ae6fd0",
    "arrays": "sha256:eb7786c9a450abd4f809a8dbce759ebf5faec08a9da021cb7dfcfe50edd22a58",
    "tensors": "sha256:ca283f07f9836a481f6f2f2b9b68f1f3bf9a5ce5389992c44e065cfc817cf983",
    "scalars": "sha256:2bcd2cca0b2593844542301319c03f80c3526e19c231985d67d87e9af6e26ff6",
}


@pytest.mark.parametrize("name", sorted(STATISTICS))
def test_statistic_digests_are_the_ones_recorded_before(name):
    assert statistic_digest(STATISTICS[name]) == STATISTIC_DIGESTS[name]


@pytest.mark.parametrize("name", sorted(CHECKSUM_DIGESTS))
def test_audit_checksums_are_the_ones_recorded_before(name):
    assert digest(_checksum_cases()[name]) == CHECKSUM_DIGESTS[name]


def test_both_digests_come_from_the_one_walker():
    value = STATISTICS["mixture"]
    out: list = [b"mixle-parallel-stats-v1\x00"]
    walk(value, STATISTIC_LAYOUT, out.append)
    assert b"".join(out) == canonical_statistic_bytes(value)
    pieces: list = []
    walk(_checksum_cases()["tree"], CHECKSUM_LAYOUT, pieces.append)
    import hashlib

    assert "sha256:" + hashlib.sha256(b"".join(bytes(p) for p in pieces)).hexdigest() == CHECKSUM_DIGESTS["tree"]


def test_a_single_bit_changes_both_digests():
    flipped = np.array([0.25, 0.75])
    flipped.view(np.uint64)[0] ^= 1
    assert statistic_digest({**STATISTICS["mixture"], "weights": flipped}) != STATISTIC_DIGESTS["mixture"]
    assert digest([flipped]) != digest([np.array([0.25, 0.75])])


@pytest.mark.parametrize("value, message", [
    (np.array([object()]), "dtype object"), ({1.5: 1}, "keys other than str/int"), ({True: 1}, "keys other than"),
    ({1, 2}, "is a set"), ([object()], r"at \$\[0\] is a object"),
])
def test_the_statistic_layout_refuses_what_is_not_plain_data(value, message):
    with pytest.raises(StatisticFormatError, match=message):
        statistic_digest(value)


@pytest.mark.parametrize("value, message", [
    (np.array([object()]), "object array"), (1 + 2j, "a complex"), (bytearray(b"x"), "a bytearray"),
    ({1, 2}, "a set"),
])
def test_the_checksum_layout_refuses_what_it_refused_before(value, message):
    with pytest.raises(TypeError, match=message):
        digest(value)
