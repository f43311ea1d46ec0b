"""The folder ``lightning-perf run`` puts first on the command's ``PYTHONPATH``: it holds ``sitecustomize`` alone, so
nothing else of the package can shadow a module of the command."""
