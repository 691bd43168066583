"""Plain helper modules the tests import (process checks, Ray study runs); no fixtures here."""
