"""Real deployments: trustfl's own rounds with every client's half on a remote node (docs/deployment.md).

:mod:`trustfl.deploy.server` runs the server's half over a transport, :mod:`trustfl.deploy.node` the client's
half, :mod:`trustfl.deploy.wire` defines what travels; :mod:`trustfl.deploy.flower` carries it over Flower
(the optional extra ``trustfl[flower]``) and :mod:`trustfl.deploy.loopback` in-process.
"""
