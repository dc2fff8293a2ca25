"""Aggregation on the server (paper Section III.C, eq. 25): the global model and its round fold (:mod:`.global_model`:
the replies folded into ``fl/weighted_mean.WeightedSum``, the weighted mean the CUs use too), Flower's server
optimizers (:mod:`.server_optimizer`), central differential privacy (:mod:`.central_dp`) and the checks every CU reply
passes before it is folded in (:mod:`.reply_checks`)."""
