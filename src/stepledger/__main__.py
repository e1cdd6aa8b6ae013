"""``python -m stepledger`` runs the command line."""

from stepledger.cli import main

if __name__ == "__main__":
    main()
