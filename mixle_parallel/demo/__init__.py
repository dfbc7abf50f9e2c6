"""The main job (``mixle-parallel demo``): a certified, audited distributed run on a local CPU mesh.

``run`` certifies, trains, fits and audits (``run_demo``/``main``); ``train`` is what each spawned
training rank executes.
"""
