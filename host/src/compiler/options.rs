//! atc option parsing and validation (in progress).
