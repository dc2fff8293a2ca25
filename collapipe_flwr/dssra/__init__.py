"""DSSRA (Algorithms 2-4): segment scheduling, channel matching, power control, Lyapunov queues."""
