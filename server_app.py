"""Flower ServerApp: the edge server of CollaPipe (paper Algorithm 1, server side).

Thin on purpose: composes the Hydra config from the run config, validates it once, builds the
server state (global encoder, decoder host, scheduler) and runs the rounds with CollaPipeStrategy.
"""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from collapipe_flwr.fl.server.server_main import run_server

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, context.run_config)
