"""The server's decoder (paper Fig. 1: the edge server's task head) as a service to the CUs' pipelines: its settings
(:mod:`.host_spec`), the host's lifecycle over the data plane's transport (:mod:`.host`), each step frame's
work (:mod:`.frame_service`), the joint and ordered decoder updates (:mod:`.joint`, :mod:`.ordered`), the open
round and replay guard (:mod:`.rounds`) and the service the strategy starts (:mod:`.service`)."""
