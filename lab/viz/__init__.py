"""The visual layer: figures (`plots`), drafting cycles recorded and explained (`cycles`) and
drawn (`drawing`), and the widget that steps through them (`inspector`). Import the module you
need: each pulls in its own front-end libraries (matplotlib, anywidget)."""
