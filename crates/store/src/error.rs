//! The store's error. A lost compare-and-set is not an error (see [`crate::Cas`]).

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error during {operation}{}: {source}", biz_id.as_ref().map(|id| format!(" (saga {id})")).unwrap_or_default())]
    Db { operation: &'static str, biz_id: Option<String>, source: sea_orm::DbErr },
    #[error(transparent)]
    Model(#[from] midflight_model::Error),
    #[error("saga {biz_id}: stored row is corrupt: {message}")]
    Corrupt { biz_id: String, message: String },
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: sea_orm::DbErr },
    #[error("migration failed: {0}")]
    Migrate(sea_orm::DbErr),
    #[error("{0}")]
    Invalid(String),
    #[error("saga {biz_id}: {message}")]
    Group { biz_id: String, message: String },
}

impl Error {
    /// This error as one member of a failed group transaction sees it: the same failure,
    /// naming that member's saga.
    pub(crate) fn for_saga(&self, biz_id: &str) -> Error {
        match self {
            Error::Db { operation, source, .. } => {
                Error::Db { operation, biz_id: Some(biz_id.to_owned()), source: source.clone() }
            }
            other => {
                Error::Group { biz_id: biz_id.to_owned(), message: format!("its group transaction failed: {other}") }
            }
        }
    }
}

/// Adds the operation (and saga) to a database error.
pub(crate) trait Context<T> {
    fn during(self, operation: &'static str, biz_id: Option<&str>) -> Result<T, Error>;
}

impl<T> Context<T> for Result<T, sea_orm::DbErr> {
    fn during(self, operation: &'static str, biz_id: Option<&str>) -> Result<T, Error> {
        self.map_err(|source| Error::Db { operation, biz_id: biz_id.map(str::to_owned), source })
    }
}
