"""Fabric manager role for SWITCHED superpods (seed 002, SW-1 … SW-6).

`fabric` holds the static graph (SW-1); `rings` plans Hamiltonian rings with
reserved links, releases them and swaps failed groups (SW-4, SW-5).
"""
