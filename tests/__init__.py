"""Tests of the GPU DRA driver."""
