"""Explicit unit conversions (SI everywhere inside the system model).

Table II quotes N_0 in dBm/Hz and the channel gains in dB; every formula in this package takes watts,
hertz, seconds, bits and linear power gains, and the conversions happen here, once.
"""

from __future__ import annotations

import numpy as np


def db_to_linear(db):
    """Power ratio in dB -> linear power ratio: 10^(dB/10)."""
    return np.power(10.0, np.asarray(db, dtype=float) / 10.0)


def dbm_to_watt(dbm):
    """Power in dBm -> W: 10^((dBm - 30)/10). Also turns dBm/Hz into W/Hz."""
    return np.power(10.0, (np.asarray(dbm, dtype=float) - 30.0) / 10.0)
