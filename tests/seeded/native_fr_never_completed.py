"""Seeded bug in the native backend's own flight recorder: entries are never marked completed.

native records each call into a flight recorder of its own (native/recorder.hpp, registered through
backends/flight_recorders.py by native/flight_recorder.py). Here a finished Work never tells the recorder
(native/work.cpp, planted bug ``fr_never_completed``): results are right and every call is recorded, but its
entry stays "started" after wait() returned, so a hang report would show every rank still inside collectives
they finished long ago. Caught by the flight-recorder contract read through the backend's own recorder
(suites/c10d/test_flight_recorder.py::test_entries_complete_with_their_work[...-backend], and pg_status's
last completed collective; the recorder=torch cases are native's declared gap).
"""

from tests.seeded.native_base import register_native_bug


DISTCONFORM_SPEC = register_native_bug("native_fr_never_completed", "fr_never_completed",
                                       "flight-recorder entries never marked completed")
