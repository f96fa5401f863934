"""`lightpath sim`: a discrete-event simulator of one pod or a cell of pods that makes
every decision with the services' own pure decision code (issue 29; docs/sim.md).

workload.py reads traces and generates the TPU v4 slice mix; engine.py runs the
virtual clock; static.py is the static-torus baseline; report.py summarises, writes
the per-job CSV and the plots; compare.py runs several configurations side by side.
"""
