"""System model of the paper (Sections III.C-D, IV): rates, delays, energy, convergence term."""
