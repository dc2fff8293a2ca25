"""Communication model, paper Section III.C: D2E uplink (eqs. 10-12) and D2D links (eqs. 13-14).

Pure functions of SI quantities: bandwidth in Hz, power in W, linear power gains, noise PSD in W/Hz,
sizes in bits, delays in s, energy in J. They broadcast over numpy arrays.

Reading chosen for Table II (see docs/system_model.md): the uplink gain h_n(t) is the linear power gain
of the round (mean gain from Table II's dB value times the fading draw), known to the BS at the start of
the round, so the expectation E_h in eqs. (10)-(12) is replaced by the round's realisation, exactly as
eqs. (33)-(35) of the paper do.
"""

from __future__ import annotations

import numpy as np

LN2 = float(np.log(2.0))


def sinr(power_w, gain, interference_w, bandwidth_hz, noise_psd_w_hz):
    """p h / (I + B N_0): the signal-to-interference-plus-noise ratio inside eqs. (10) and (13)."""
    return np.asarray(power_w, dtype=float) * gain / (interference_w + bandwidth_hz * noise_psd_w_hz)


def shannon_rate(bandwidth_hz, power_w, gain, interference_w, noise_psd_w_hz):
    """r = B log2(1 + p h / (I + B N_0)) in bit/s: eq. (10) (uplink, B = B_n^U) and the D2D rate
    inside eq. (13) (B = B^dd, h = h_dd, I = I_dd)."""
    return bandwidth_hz * np.log2(1.0 + sinr(power_w, gain, interference_w, bandwidth_hz, noise_psd_w_hz))


def transfer_delay(bits, rate_bps):
    """Size over rate (s): eq. (11) with bits = z_n^enc + theta_n^enc, eq. (13) with bits = z^s + g^{s+1}."""
    rate = np.asarray(rate_bps, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(rate > 0, np.asarray(bits, dtype=float) / np.where(rate > 0, rate, 1.0), np.inf)


def transmit_energy(power_w, delay_s):
    """E = p * tau (J): eq. (12) for the CU (p_n), eq. (14) for device k (p_k)."""
    return np.asarray(power_w, dtype=float) * delay_s
