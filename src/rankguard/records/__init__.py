"""What the processes of a job write for each other and for the people who read it afterwards:
the ranks' progress ledger and its rings of recent operations, their copy in the run's logs, a
replacement rank's word that it joined, a node's beat, the JSON-lines journal, and the private
files and folders they are kept in."""
