"""Throughput: measured on this machine (benchmark), its searchable fields (measured), and predicted from a
row's numbers and the hardware table (roofline)."""
