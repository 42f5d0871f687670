"""Screens of the tokview app: samples, inspect, generate, doctor, stats, help, small modals."""
