"""Interop checks: run golden vector files (the shared schema) against this implementation."""
