"""The front-end role: what every client-facing edge of a node calls.

The HTTP edge, the binary client protocol and the CLI reach the log through one ``FrontEnd``
(``frontend.service``): it routes each append to the log's sequencer node (forwarding with a
hop limit, or redirecting), coordinates reads over the storage nodes, and answers tail, trim,
find-time and nodesets with f-majority calls. It depends on the local sequencer and the
failure detector only through the small protocols in ``frontend.ports``, so it imports no
other role.
"""
