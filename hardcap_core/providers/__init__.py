"""Upstreams behind one interface (:class:`~hardcap_core.providers.base.Provider`)."""
