"""The visual layer: figures (`plots`), drafting cycles explained (`cycles`), drawn (`drawing`) and
stepped through (`inspector`). Import the module you need: each pulls in its own front-end libraries."""
