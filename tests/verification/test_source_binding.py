"""A certificate binds every file of the code the executor runs (issue 23 item 3b).

The attack: a third-party EM backend is certified honestly, then its module is edited (to overwrite
half of every chunk) keeping the file's size and modification time; the gate must refuse the
certificate as stale, in the same process and in a new one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.verification.admission import AdmissionDecision, save_certificate
from mixle_parallel.verification.attestation import executor_source_digest
from mixle_parallel.verification.source_binding import builtin_files, package_files
from tests.verification.vhelpers import StubExecutor

_BACKEND = '''
"""A third party's EM backend: the local thread runner under its own name (it claims worker processes)."""
from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.handle import handle_from_runner

HALF = 0  # 1: the first half of every chunk is overwritten with zeros


def _cut(data):
    data = data.copy()
    data[: len(data) // 2 * HALF] = 0
    return data


class Runner(LocalChunkRunner):
    name = "NAME"

    def scatter(self, chunks):
        super().scatter([EncodedChunk(c.chunk_id, c.start, c.stop, _cut(c.data)) for c in chunks])


def factory(data, *, num_workers=None, **params):
    return handle_from_runner(Runner(num_workers or 2), data, **params)


factory.encoded_data_options = frozenset({"num_workers"})
factory.planned_workers = lambda options: options.num_workers or 2
factory.worker_processes = True
'''


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    """A fresh trust store per test."""
    for name in ("MIXLE_PARALLEL_CERTIFICATE", "MIXLE_PARALLEL_VERIFYING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _rewrite_keeping_size_and_mtime(path: Path, old: str, new: str) -> None:
    assert len(old) == len(new)
    before = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """A third-party backend package on sys.path, registered under a fresh name; its name and module file."""
    from mixle_parallel.executors.registry import register_encoded_data_backend, unregister_encoded_data_backend

    name = f"acme_em_{uuid.uuid4().hex[:8]}"
    package = tmp_path / "site" / name
    package.mkdir(parents=True)
    module = package / "__init__.py"
    module.write_text(_BACKEND.replace("NAME", name))
    (package / "defaults.json").write_text('{"components": 2}\n')  # package data
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    imported = __import__(name)
    register_encoded_data_backend(name, imported.factory)
    yield name, module
    unregister_encoded_data_backend(name)
    sys.modules.pop(name, None)


def _fit_args():
    from mixle_parallel.executors.estimation.models import GaussianEstimator, MixtureEstimator

    data = np.random.default_rng(0).normal(size=200)
    return data, MixtureEstimator([GaussianEstimator(), GaussianEstimator()])


def test_an_edit_that_keeps_size_and_mtime_changes_the_digest(tmp_path):
    source = tmp_path / "executor_src.py"
    source.write_text("VALUE = 1\n")

    class Pinned(StubExecutor):
        def source_files(self):
            return [source]

    first = executor_source_digest(Pinned())
    assert executor_source_digest(Pinned()) == first
    _rewrite_keeping_size_and_mtime(source, "VALUE = 1", "VALUE = 2")
    assert executor_source_digest(Pinned()) != first  # no cache keyed on (path, size, mtime)


def test_builtins_bind_the_whole_library_and_others_their_package():
    files = builtin_files()
    for part in ("contracts/certificate.py", "verification/admission.py", "executors/estimation/handle.py",
                 "executors/torch/session.py", "mixle_parallel/__init__.py"):
        assert any(str(f).endswith(part) for f in files), part
    assert not any("__pycache__" in f.parts for f in files)
    tests = package_files("tests.verification.vhelpers")  # a third party: its top-level package's tree
    assert any(f.name == "zoo.py" for f in tests) and any(f.name == "conftest.py" for f in tests)


def test_a_third_party_backend_binds_its_package_and_package_data(backend):
    from mixle_parallel.executors.estimation.admission.executor_identity import EMExecutorIdentity

    name, module = backend
    identity = EMExecutorIdentity(name)
    bound = {Path(p) for p in identity.source_files()}
    assert {module.resolve(), (module.parent / "defaults.json").resolve()} <= bound
    before = executor_source_digest(identity)
    _rewrite_keeping_size_and_mtime(module.parent / "defaults.json", '"components": 2', '"components": 3')
    assert executor_source_digest(identity) != before


def test_an_edited_third_party_backend_is_refused_as_stale(backend, tmp_path, home):
    from mixle_parallel.executors.estimation.api import encoded_data
    from mixle_parallel.verification.harness.run import verify

    name, module = backend
    report = verify(name, ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()
    cert = save_certificate(report.certify(name), tmp_path / "cert.json")
    data, estimator = _fit_args()
    encoded_data(data, estimator=estimator, backend=name, num_workers=2, admission=str(cert)).close()  # admitted

    _rewrite_keeping_size_and_mtime(module, "HALF = 0", "HALF = 1")  # now overwrites half of every chunk
    with pytest.raises(NotAdmittedError, match="check 'source_digest' failed"):
        encoded_data(data, estimator=estimator, backend=name, num_workers=2, admission=str(cert))

    script = textwrap.dedent(f"""
        import numpy as np
        from mixle_parallel.contracts import NotAdmittedError
        from mixle_parallel.executors.estimation.api import encoded_data
        from mixle_parallel.executors.estimation.models import GaussianEstimator, MixtureEstimator
        from mixle_parallel.executors.registry import register_encoded_data_backend
        import {name}
        register_encoded_data_backend({name!r}, {name}.factory)
        try:
            encoded_data(np.zeros(200), estimator=MixtureEstimator([GaussianEstimator(), GaussianEstimator()]),
                         backend={name!r}, num_workers=2, admission={str(cert)!r}).close()
        except NotAdmittedError as exc:
            print("REFUSED", exc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(module.parent.parent), *sys.path]),
           "MIXLE_PARALLEL_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "REFUSED" in done.stdout and "check 'source_digest' failed" in done.stdout, done.stdout + done.stderr
    assert "check 'signature' failed" not in done.stdout  # stale code, not an untrusted key


def test_a_runner_outside_the_bound_code_is_refused(backend, tmp_path, monkeypatch):
    from mixle_parallel.executors.estimation.admission.em_admission import refuse_unbound_code

    name, _ = backend
    elsewhere = tmp_path / "other_site"
    elsewhere.mkdir()
    (elsewhere / f"{name}_runner.py").write_text("class Runner:\n    pass\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    runner = __import__(f"{name}_runner").Runner

    class Handle:
        pass

    handle = Handle()
    handle.runner = runner()  # type: ignore[attr-defined]
    Handle.__module__ = name  # the handle class claims the factory's package; the runner lives elsewhere
    decision = AdmissionDecision("certified", "sha256:" + "ab" * 32)
    with pytest.raises(NotAdmittedError, match=f"runs {name}_runner.Runner .*outside the code its certificate"):
        refuse_unbound_code(handle, name, decision)
    refuse_unbound_code(handle, name, AdmissionDecision("local", None))  # nothing bound, nothing to refuse
    sys.modules.pop(f"{name}_runner", None)


_SIBLING_FACTORY = '''
"""A third party's EM backend as a lone module whose chunk handling lives in a sibling module."""
from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.handle import handle_from_runner

from NAME_cut import cut


class Runner(LocalChunkRunner):
    name = "NAME"

    def scatter(self, chunks):
        super().scatter([EncodedChunk(c.chunk_id, c.start, c.stop, cut(c.data)) for c in chunks])


def factory(data, *, num_workers=None, **params):
    return handle_from_runner(Runner(num_workers or 2), data, **params)


factory.encoded_data_options = frozenset({"num_workers"})
factory.planned_workers = lambda options: options.num_workers or 2
factory.worker_processes = True
'''

_SIBLING = '''
"""The sibling module: what the factory's runner does to every chunk."""
import NAME_deep

HALF = 0  # 1: the first half of every chunk is overwritten with zeros


def cut(data):
    data = data.copy()
    data[: len(data) // 2 * HALF * NAME_deep.ON] = 0
    return data
'''


@pytest.fixture
def sibling_backend(tmp_path, monkeypatch):
    """A backend whose factory is a top-level module importing a sibling module (which imports another)."""
    from mixle_parallel.executors.registry import register_encoded_data_backend, unregister_encoded_data_backend

    name = f"acme_sib_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{name}.py").write_text(_SIBLING_FACTORY.replace("NAME", name))
    (site / f"{name}_cut.py").write_text(_SIBLING.replace("NAME", name))
    (site / f"{name}_deep.py").write_text("ON = 1\n")
    monkeypatch.syspath_prepend(str(site))
    imported = __import__(name)
    register_encoded_data_backend(name, imported.factory)
    yield name, site
    unregister_encoded_data_backend(name)
    for module in (name, f"{name}_cut", f"{name}_deep"):
        sys.modules.pop(module, None)


def test_the_digest_binds_the_modules_a_factory_imports(sibling_backend):
    from mixle_parallel.executors.estimation.admission.executor_identity import EMExecutorIdentity

    name, site = sibling_backend
    bound = {Path(p) for p in EMExecutorIdentity(name).source_files()}
    wanted = {(site / f"{name}{suffix}.py").resolve() for suffix in ("", "_cut", "_deep")}
    assert wanted <= bound
    assert not any("site-packages" in p.parts or p.name == "os.py" for p in bound)  # stdlib, distributions: not bound
    from mixle_parallel.verification.source_binding import builtin_files
    assert not (bound & builtin_files())  # the library is bound by the identity itself, not as third-party code


def test_an_edited_sibling_module_needs_a_new_certificate(sibling_backend, tmp_path):
    from mixle_parallel.executors.estimation.api import encoded_data
    from mixle_parallel.verification.harness.run import verify

    name, site = sibling_backend
    report = verify(name, ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()
    cert = save_certificate(report.certify(name), tmp_path / "cert.json")
    data, estimator = _fit_args()
    encoded_data(data, estimator=estimator, backend=name, num_workers=2, admission=str(cert)).close()  # admitted

    _rewrite_keeping_size_and_mtime(site / f"{name}_cut.py", "HALF = 0", "HALF = 1")  # the sibling, not the factory
    with pytest.raises(NotAdmittedError, match="check 'source_digest' failed") as refused:
        encoded_data(data, estimator=estimator, backend=name, num_workers=2, admission=str(cert))
    assert f"{name}_cut.py" in str(refused.value)  # the refusal names the file that changed
    _rewrite_keeping_size_and_mtime(site / f"{name}_cut.py", "HALF = 1", "HALF = 0")
    _rewrite_keeping_size_and_mtime(site / f"{name}_deep.py", "ON = 1", "ON = 0")  # two imports away
    with pytest.raises(NotAdmittedError, match="check 'source_digest' failed"):
        encoded_data(data, estimator=estimator, backend=name, num_workers=2, admission=str(cert))


def test_a_package_binds_what_its_modules_import_outside_it(tmp_path, monkeypatch):
    from mixle_parallel.verification.source_binding import bound_files

    name = f"acme_pkg_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("from .impl import factory\n")
    (site / name / "impl.py").write_text(f"import json\n\ndef factory():\n    import {name}_helper\n"
                                         f"    return {name}_helper.VALUE\n")
    (site / f"{name}_helper.py").write_text("VALUE = 1\n")  # imported lazily, never run before the digest
    monkeypatch.syspath_prepend(str(site))
    __import__(name)
    bound = bound_files(name)
    assert (site / f"{name}_helper.py").resolve() in bound and (site / name / "impl.py").resolve() in bound
    assert f"{name}_helper" not in sys.modules  # found without importing it
    assert not any(p.name == "json" or "json" in p.parts for p in bound)  # the standard library is not bound
    sys.modules.pop(name, None)
    sys.modules.pop(f"{name}.impl", None)
