"""The shared test kit: helpers every test folder imports as ``kit.<module>`` (pyproject's
``pythonpath = ["tests"]`` puts this folder's parent on ``sys.path``; worker processes get
the driver's ``sys.path``, so block functions defined here load by reference there too).

* ``dispatch``: the dispatcher driven by scripted events on a fake clock (unit tests).
"""
