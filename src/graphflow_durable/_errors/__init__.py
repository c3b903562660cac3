"""The exception tree's classes, by category; :mod:`graphflow_durable.errors` is their public home
(import them from there). Imports nothing from the rest of the package.
"""
