"""Loopback tool services (payments, bookings, email) and clients for tests and demos."""
