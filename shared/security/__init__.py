"""Client authentication, permissions and quotas (docs/SECURITY.md): signed bearer tokens
(``tokens``), per-principal grants on log id ranges (``permissions``), the reloadable
credentials state and its per-token cache (``auth``), and per-principal rate limits
(``quotas``)."""
