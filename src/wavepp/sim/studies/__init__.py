"""What the simulator is run for: a setting (sim_setup.py) built and run (scenario.py), the
systems compared (systems.py), the grids (grid.py), the attribution of a speed-up to its
mechanisms (attribution.py), calibration against this machine (calibrate.py), replicas behind a
router (replicas.py) and the output (output.py). Built on everything else of the simulator."""
