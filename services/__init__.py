"""The control-plane services: one package per service, each a pure core with thin I/O shells.

Services talk to each other only through events on the bus; `koordbus` wires them together.
"""
